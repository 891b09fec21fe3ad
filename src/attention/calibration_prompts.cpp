// The built-in calibration text: ten English paragraphs of different kinds (history, science,
// a recipe, a technical explanation, a story with dialogue, a contract, travel, nature, a letter,
// a news report), about 2,600 tokens in all with a Llama-style tokenizer.
#include "attention/calibration.h"

namespace fdpp {

const std::vector<std::string>& builtin_calibration_prompts() {
  static const std::vector<std::string> prompts = {
      // History.
      "The printing press did not arrive in Europe as a single invention but as a combination of older ideas. "
      "Screw presses had been used for centuries to squeeze olives and grapes, paper had travelled west from China "
      "through the Islamic world, and oil-based inks were already familiar to painters. What Johannes Gutenberg "
      "added around 1450 in Mainz was a practical way to cast large numbers of identical metal letters, together "
      "with an ink that would cling to them. Within fifty years, presses were working in more than two hundred "
      "cities, and millions of books had been printed. Prices fell, and reading spread from monasteries and "
      "universities to merchants, craftsmen and their families. Scholars could compare identical copies of a text "
      "for the first time, which made errors easier to find and arguments easier to follow. The Reformation, the "
      "scientific societies of the seventeenth century and the newspapers of the eighteenth all depended on cheap "
      "print. Historians still debate how much the press caused these changes and how much it merely sped them "
      "up, but few doubt that the world after it looked very different from the world before.",
      // Science.
      "Photosynthesis is the process by which plants, algae and some bacteria turn light into chemical energy. "
      "Inside the chloroplast, pigments such as chlorophyll absorb mostly red and blue light and reflect green, "
      "which is why leaves look the colour they do. The absorbed energy drives electrons through a chain of "
      "proteins embedded in the thylakoid membrane, splitting water molecules and releasing oxygen as a by-product. "
      "The energy captured along the way is stored in two carrier molecules, ATP and NADPH. In the second stage, "
      "known as the Calvin cycle, the enzyme RuBisCO fixes carbon dioxide from the air into a three-carbon sugar, "
      "using the stored energy to do so. RuBisCO is slow and sometimes grabs oxygen instead of carbon dioxide, a "
      "wasteful reaction called photorespiration. Plants in hot, dry climates have evolved workarounds: maize and "
      "sugar cane concentrate carbon dioxide in special cells, while cacti open their pores only at night. "
      "Together, photosynthetic organisms fix roughly a hundred billion tonnes of carbon each year, feeding almost "
      "every food chain on the planet.",
      // A recipe.
      "To make a simple loaf of bread, you will need 500 grams of strong white flour, 10 grams of salt, 7 grams of "
      "dried yeast and about 350 millilitres of lukewarm water. Mix the flour and salt in a large bowl, then stir "
      "the yeast into the water and pour it in. Bring everything together with your hand or a wooden spoon until "
      "no dry flour remains. Tip the dough onto a clean surface and knead it for ten minutes, pushing it away with "
      "the heel of your hand, folding it back and turning it a quarter turn each time. It is ready when it feels "
      "smooth and springs back when you press it. Put it back in the bowl, cover it with a damp towel and leave it "
      "somewhere warm for an hour, or until it has doubled in size. Knock it back, shape it into a round and place "
      "it on a floured tray. Let it rise again for thirty minutes while the oven heats to 220 degrees. Slash the "
      "top with a sharp knife and bake for 30 to 35 minutes, until the loaf sounds hollow when tapped underneath. "
      "Let it cool on a rack before slicing, however tempting it smells.",
      // Technical.
      "A hash table stores key and value pairs so that looking up a key takes, on average, the same short time no "
      "matter how many entries the table holds. It works by passing each key through a hash function, which turns "
      "it into a number, and using that number modulo the size of an internal array to choose a slot. Two "
      "different keys will sometimes land in the same slot, an event called a collision. Separate chaining handles "
      "collisions by keeping a small linked list in each slot, while open addressing probes other slots in a fixed "
      "sequence until it finds an empty one. Either way, performance depends on the load factor, the ratio of "
      "stored entries to slots. When the load factor grows past a threshold, often around 0.75, the table "
      "allocates a larger array and reinserts every entry, an operation that is expensive but rare enough that the "
      "average cost per insertion stays constant. A poor hash function that maps many keys to the same few slots "
      "destroys these guarantees, which is why attackers have sometimes crashed web servers simply by sending "
      "carefully chosen request parameters.",
      // A story with dialogue.
      "The lighthouse keeper had not seen another person for eleven days when the boat appeared. It was small and "
      "painted a faded yellow, and it rode the swell as if it had been doing so for a long time. \"Ahoy!\" called a "
      "voice, thin against the wind. Martha put down her tea and went out onto the gallery. A young man stood in "
      "the bow, waving both arms. \"Is this Skerry Point?\" he shouted. \"It is,\" she called back, \"though I can't "
      "think why anyone would want it.\" He laughed, and the laugh carried better than his words had. \"I've "
      "brought the post. And a cake, from my mother. She says you'll have forgotten what cake tastes like.\" Martha "
      "felt something loosen in her chest that she had not known was tight. She climbed down the iron ladder to "
      "the landing stage, where the spray soaked her boots, and caught the rope he threw. The parcel was wrapped "
      "in oilcloth and tied with green string. \"Tell your mother,\" she said, \"that she is quite right.\" They sat "
      "on the steps and ate half the cake while the gulls watched, and neither of them mentioned the weather.",
      // A contract.
      "This Agreement is entered into on the date of the last signature below between the Supplier and the "
      "Customer. The Supplier shall deliver the goods described in Schedule A to the address specified by the "
      "Customer within thirty days of receiving a written purchase order. Risk in the goods shall pass to the "
      "Customer on delivery, but title shall remain with the Supplier until payment has been received in full. "
      "The Customer shall pay each invoice within forty-five days of its date; late payments shall bear interest "
      "at four percent above the base rate of the central bank, calculated daily. Either party may terminate this "
      "Agreement by giving ninety days' written notice to the other, or immediately if the other party commits a "
      "material breach that is not remedied within twenty-one days of notice. Neither party shall be liable for "
      "any failure to perform caused by events beyond its reasonable control, including fire, flood, war or the "
      "actions of any government. This Agreement constitutes the entire understanding between the parties and "
      "supersedes all prior negotiations. It shall be governed by the laws of the jurisdiction in which the "
      "Supplier has its registered office.",
      // Travel.
      "Kyoto rewards those who get up early. By seven in the morning the stone paths of Fushimi Inari are nearly "
      "empty, and the thousands of orange gates climbing the mountain glow in the low sun. Each gate was donated "
      "by a business or a family, and the donor's name is painted in black on the back. The full walk to the "
      "summit and back takes two or three hours, passing small shrines, fox statues holding keys in their mouths, "
      "and tea houses that open as the crowds arrive. In the afternoon, the bamboo grove at Arashiyama is best "
      "avoided, but the nearby temple gardens are quieter than you might expect, with moss so thick it looks like "
      "velvet. In the evening, the narrow lanes of Gion fill with the smell of grilled eel and sweet soy, and if "
      "you are lucky you may glimpse a geiko hurrying to an appointment. Buses are frequent but slow; a rented "
      "bicycle is often faster, since the city is flat and most sights lie within a few kilometres of each other.",
      // Nature.
      "Every autumn, monarch butterflies from eastern North America begin a journey of up to four thousand "
      "kilometres to a few patches of fir forest in the mountains of central Mexico. None of the butterflies that "
      "make the trip has ever been there before; the ones that left the previous spring were their great-great-"
      "grandparents. They navigate using a sun compass in their antennae, corrected for the time of day by an "
      "internal clock, and probably a magnetic sense as well. Along the way they feed on nectar to build up fat, "
      "and by the time they arrive they cluster on the trees in such numbers that branches bend under their "
      "weight. They spend the winter there in a kind of suspended state, and in February and March they mate and "
      "fly north. The females lay their eggs on milkweed, the only plant their caterpillars will eat, and the "
      "cycle continues over several short-lived generations. Loss of milkweed to farming, logging in the "
      "wintering forests and extreme weather have all reduced their numbers, and conservation groups now "
      "encourage gardeners to plant milkweed along the migration route.",
      // A letter.
      "Dear Aunt Helen, thank you so much for the books you sent for my birthday. I started the one about the "
      "Antarctic expedition the same evening and stayed up far too late finishing it; I could not believe they "
      "survived on seal meat for months and still managed to sail a lifeboat across that ocean. School has been "
      "busy. We have exams in three weeks, and I am worried about chemistry, mostly the calculations with moles, "
      "which never seem to come out the way the teacher's do. Dad says he was terrible at it too, which is not as "
      "comforting as he thinks. The garden is finally coming back after the frost. The apple tree you helped us "
      "plant is covered in blossom this year, and Mum thinks we might get our first proper crop. Would you like "
      "to come and visit in the summer? We could go walking on the coast path like we did before, and I promise "
      "not to get us lost this time. Please give my love to Uncle Tom and tell him the chess set is still waiting. "
      "With love, Anna.",
      // News.
      "The city council voted on Tuesday evening to approve a new network of protected cycle lanes, ending months "
      "of debate that at times filled the public gallery. The plan will add thirty-two kilometres of lanes "
      "separated from traffic by concrete kerbs, linking the central station with the university, the hospital "
      "and three residential districts to the north. Supporters argued that the lanes would reduce congestion and "
      "air pollution and make cycling safe for children and older people, pointing to a survey in which sixty "
      "percent of residents said they would cycle more if they felt safer. Opponents, including several shop "
      "owners on the main high street, warned that the loss of roughly four hundred parking spaces would drive "
      "customers away. The council said it would monitor footfall and review the scheme after two years. "
      "Construction is expected to begin in the spring and to cost about eighteen million, most of it from a "
      "national transport fund. The vote passed by twenty-one to fourteen, with two abstentions. The mayor called "
      "it a decision for the next generation, and promised that the work would be phased to limit disruption.",
  };
  return prompts;
}

}  // namespace fdpp
